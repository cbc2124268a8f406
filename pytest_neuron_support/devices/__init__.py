"""The device seam: one table (``table.DEVICES``) of everything that differs between neuron, cuda and
cpu, with a default-free row per device, and the short-lived subprocess probes that read a machine.
"""
