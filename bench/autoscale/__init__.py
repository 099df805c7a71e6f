"""`pdserve bench autoscale`: the autoscaler against every fixed deployment on a shifting load."""
