"""Deciders: choose an overlap strategy from the papers' rules, on the cost model or live.

Each module is one paper's decision procedure; none of them imports torch.
"""
