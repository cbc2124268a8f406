"""The catalog: ``models.yaml`` parsed and validated (``load``) into the models a session checks."""
