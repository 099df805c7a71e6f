"""The cost model every decision reads: what a step costs (profile), what it runs (step shape),
and how much prompt a step may take under an ITL SLO (step budget).

Torch-free, so that the router imports it as readily as the workers, the simulator and the
planner do; it sits above core/ (it reads its config and block arithmetic) and below everything
that decides.
"""
