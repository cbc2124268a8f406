"""The CPU side of a verdict: the free-running CPU reference (``reference``), the teacher-forced CPU check
of the device's tokens (``forced``) and the fluency judge (``judge``), each a process of its own that
needs no device cores.
"""
