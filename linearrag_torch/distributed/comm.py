"""The sharded engine's communicator: runtime.comm.Comm (it lives below retrieval/, which runs the graph round over
it; its one-process form, every collective the identity, is what the single-process engine runs through)."""
from ..runtime.comm import ONE_PROCESS, Comm

__all__ = ["Comm", "ONE_PROCESS"]
