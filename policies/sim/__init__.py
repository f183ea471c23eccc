"""A trace-driven simulator of a GPU cluster, driving the same policies as the agent.

The job model is the one behind the Pollux (OSDI '21) evaluation, as
../shared/data/pollux/README.md states it: measured step times per
placement, statistical efficiency from measured gradient statistics, a
fixed number of epochs per application, a 60 s scheduling interval and a
30 s penalty on every (re)allocation.
"""
