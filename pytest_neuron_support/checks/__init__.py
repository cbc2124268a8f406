"""The check kinds (inference, training) behind one protocol (``kind.CheckKind``), listed once
(``registry.KINDS``); ``run.run_check`` does what every kind shares (lease window, device run, release,
failure mapping) and ``plan`` plans each kind; ``rows`` holds a row's identity before it runs.
"""
