"""A trace-driven simulator of a GPU cluster, driving the same policies as the agent.

The job model is the one behind the Pollux (OSDI '21) evaluation, as
../shared/data/pollux/README.md states it: measured step times per
placement, statistical efficiency from measured gradient statistics, a
fixed number of epochs per application, a 60 s scheduling interval and a
30 s penalty on every (re)allocation.

A package of its own above :mod:`dlsub.policies` (which reads no files),
beside the agent: it reads and writes files, in its readers and writers
only. :mod:`~dlsub.sim.apps` reads an application's traces,
:mod:`~dlsub.sim.workload` and :mod:`~dlsub.sim.generate` read and write
workload CSVs (and the Philly trace), :mod:`~dlsub.sim.cluster_file` reads
``--cluster`` TOML, :mod:`~dlsub.sim.report` writes the results, and
:mod:`~dlsub.sim.engine` finds each job's traces folder (``traces_dir``).
The models the policies are run over, :mod:`~dlsub.sim.information`,
:mod:`~dlsub.sim.performance`, :mod:`~dlsub.sim.sia_setting` and
:mod:`~dlsub.sim.published`, read no files (an import-linter contract in
pyproject.toml holds them to it). The shipped data, the Pollux workloads
and traces (``pollux/``) and the scenarios (``scenarios/``), are package
data beside these modules.
"""
