"""Routing policies: one module per policy, each a Filter/Scorer/Picker composition."""
