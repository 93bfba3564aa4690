"""The inference lanes: the supervisor in the daemon, the lane process and its real-time loop, the zygote that
forks lanes, the dispatch table and the per-stream statistics. Never imports control/."""
