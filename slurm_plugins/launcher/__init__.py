"""The batch launcher: the job's side of dlsub on a compute node, in Python.

Slurm runs the rendered ``slurm_plugins/batch.sh``; after the checks that
must precede Python it execs ``python -m dlsub.slurm_plugins.launcher ROLE``
with the job's settings. One role per way the script runs (``roles.py``):

* ``main``: the job's batch step. Runs this node's container, or one per
  node through ``srun`` (a gang) or a heterogeneous job's two parts; then
  requeues, moves or ends the job (``policy.py``) and its worker array.
* ``node``: one node of a gang (``srun``'s task): its container, no more.
* ``worker``: a task of an elastic job's held worker array: joins the
  running main job's rendezvous (``records.py``), and goes back to the held
  pool (``scontrol requeuehold``) whenever it leaves the group before the
  training ends.

Beside them: the signals the batch shell forwards to the container
(``signals.py``), the node's GPUs (``gpus.py``), the node's runtime
directory, network interface and rendezvous port (``host.py``), the
container's run and exit status (``container.py``), and the files it writes
in the job directory (``records.py``). Every Slurm call goes through
:class:`~dlsub.slurm_plugins.client.SlurmClient`.
"""
