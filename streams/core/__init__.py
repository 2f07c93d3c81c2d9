"""The control core: a pure, typed state machine for jobs, requests and attempts.

The live control plane (the Faust shell in ``streams/app.py``) and the simulator
(``sim/core_driver.py``) both drive ``ControlCore``: events in (``events``), decisions out
(``decisions``), state persisted to a ``CoreStore``. Modules: ``state`` (statuses, requests,
attempts, jobs and their records), ``config``, ``fleet`` (pools + the core's own counts),
``admission`` (the verdict on a submitted job), ``jobs`` (tracking, keyed by job), ``dispatcher`` (fair release, routing,
attempts, keyed by request), ``recovery`` (back-offs, dead pools, stragglers), ``restoring``
(a request taken back from the store after a restart), ``core``.
"""

from .admission import Verdict, judge
from .config import CoreConfig
from .core import ControlCore
from .decisions import Decision, Dispatch, FailRequest, Forget, JobChanged, Problem, QueueRequest
from .dispatcher import Reports
from .events import (
    AttemptFailed,
    CancelRequested,
    Event,
    FleetObserved,
    JobAdmitted,
    JobEnded,
    JobSubmitted,
    KvReady,
    OutputWritten,
    ProfilesUpdated,
    PromptSize,
    RequestQueued,
    ResultReceived,
    TenantsUpdated,
)
from .state import Attempt, JobRecord, RequestState, RequestStatus
from .store import CoreStore, DictStore, NullStore
from .tracker import JobTracker

__all__ = [
    "Attempt",
    "AttemptFailed",
    "CancelRequested",
    "ControlCore",
    "CoreConfig",
    "CoreStore",
    "Decision",
    "DictStore",
    "Dispatch",
    "Event",
    "FailRequest",
    "FleetObserved",
    "Forget",
    "JobAdmitted",
    "JobEnded",
    "JobTracker",
    "JobChanged",
    "JobRecord",
    "JobSubmitted",
    "KvReady",
    "NullStore",
    "OutputWritten",
    "Problem",
    "ProfilesUpdated",
    "PromptSize",
    "QueueRequest",
    "Reports",
    "RequestQueued",
    "RequestState",
    "RequestStatus",
    "ResultReceived",
    "TenantsUpdated",
    "Verdict",
    "judge",
]
