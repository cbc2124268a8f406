"""The planner: how many cores a model needs and how it is sharded over them, from its config and its
weights' headers, without downloading a weight.
"""
