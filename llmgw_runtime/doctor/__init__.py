"""``llmgw doctor``: what this node can run, and what to do when it can run nothing."""
