"""`pdserve bench admission`: the router's admission modes against the same overload."""
