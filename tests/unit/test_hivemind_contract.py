"""The fence around hivemind: every private hivemind name swarmd relies on, checked against the installed hivemind.

Why: swarmd pins hivemind 1.1.12 (pyproject.toml) and builds on more of it than its public API: its averagers,
optimizer and progress tracker are hivemind subclasses that override private methods (`_aggregate_with_group`,
`_do`, `_update_scheduler`...), read private state (`_running_groups`, `_matchmaking`...), swap private objects
(`DHT._inner_pipe`, `RSAPrivateKey._process_wide_key`) and copy a few private loops. hivemind may rename or reshape
any of that in any release without notice, and most of it would not fail loudly: an override whose name no longer
exists is simply never called, and an attribute written under an old name changes nothing. So these names are a
contract, and CONTRACT below is all of it: `(owner, name, kind, parameters)`, one row per name (and one more where
swarmd also relies on what upstream's code does there), with the swarmd module that relies on it in the row's comment
("benchmark" for benchmarks/). Public API is not fenced, but for the public methods swarmd overrides.

kind:
- "method" / "function": callable on the class / module. `parameters`: the parameter names swarmd relies on, in
  order (self/cls left out; any *args / **kwargs spelt "*args" / "**kwargs"): the whole signature, or its first
  parameters when the tuple ends with "...". Overrides name the whole signature (upstream calls them with it).
- "attribute": a class attribute, property or method of the class, or an instance attribute that the class's own
  source assigns (`self.<name> = ...` anywhere in it, e.g. in `_run_internal` for the averager process's state).
- "module attribute": a module's global; `parameters`: keys it must hold (a mapping) or the one value it must have.
- "source": upstream behaviour a swarmd override plugs into; `parameters`: snippets its source must contain.

Three more tests keep the table complete and honest, from swarmd's source (ast) and its classes' MROs:
- test_every_private_override_is_fenced: a swarmd class that defines a private name (a method, a class attribute,
  or `self.<name> = ...`) which a hivemind class of its MRO also has, must have a row for that class and name;
- test_every_private_hivemind_name_swarmd_touches_is_fenced: a private attribute name swarmd (or a benchmark) uses
  on any object or imports from hivemind, that swarmd never defines and hivemind does, must have a row;
- test_overrides_keep_upstreams_sync_or_async: an override is a coroutine, an async generator or a plain function
  exactly where upstream's is (hivemind awaits, iterates or calls it).

When this fails (a hivemind upgrade, or a new override): read the whole list in the message; for each entry, read
hivemind's new code for that name and adapt the swarmd module named in its row (or drop what upstream now does
itself), then update the row. Do not just edit the table to match: the row is there because swarmd's code
assumes exactly what it says.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
from collections.abc import Mapping
from pathlib import Path

import hivemind
import hivemind.averaging.averager as averager_module
import hivemind.compression.quantization as quantization
import hivemind.compression.serialization as serialization
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.averaging.key_manager import GroupKeyManager
from hivemind.averaging.matchmaking import Matchmaking, PotentialLeaders
from hivemind.averaging.partition import TensorPartContainer, TensorPartReducer
from hivemind.compression.quantization import BlockwiseQuantization, Quantization
from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.optimizer import Optimizer
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.p2p import P2P
from hivemind.p2p.servicer import ServicerBase
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

PACKAGE_OF_HIVEMIND = Path(hivemind.__file__).resolve().parent

# fmt: off
CONTRACT = [  # (owner, name, kind, parameters),  # who relies on it: a module of swarmd/swarm/ unless named
    # --- DecentralizedAverager (hivemind/averaging/averager.py): every swarmd averager subclasses it -------------
    (DecentralizedAverager, "_aggregate_with_group", "method", ("group_info", "min_vector_size", "**kwargs")),  # partial_rounds
    (DecentralizedAverager, "_aggregate_with_group", "source", (
        "bandwidths, mode_ids, user_gathered_bytes = zip(*map(self.serializer.loads, group_info.gathered))",
    )),  # robust_aggregation: each member's gathered epoch, read from upstream's triples
    (DecentralizedAverager, "_running_groups", "attribute", ()),  # partial_rounds, averager_shutdown, averager_gate
    # partial_rounds: the runner is the result of the group's Future
    (DecentralizedAverager, "_run_allreduce_inplace_", "source", ("self._running_groups[group_id].set_result(runner)",)),
    # robust_aggregation: an override that is a copy of upstream's body with the runner swapped
    (DecentralizedAverager, "_run_allreduce_inplace_", "method", ("tensors", "group_info", "group_id", "**kwargs")),
    (DecentralizedAverager, "_run_allreduce_inplace_", "source", (
        "runner = AllReduceRunner(", "p2p=self._p2p,", "servicer_type=type(self),", "prefix=self.prefix,",
        "ordered_peer_ids=group_info.peer_ids,", "tensor.add_(update, alpha=self._averaging_alpha)",
        "self.last_updated = get_dht_time()", "self._state_updated.set()",
    )),
    (DecentralizedAverager, "_averaging_alpha", "attribute", ()),  # robust_aggregation
    (DecentralizedAverager, "_shutdown", "method", ("timeout",)),  # averager_shutdown
    (DecentralizedAverager, "_p2p", "attribute", ()),  # averager_shutdown, state_stream
    (P2P, "_client", "attribute", ()),  # dialer (p2pd's connect); benchmark: home_relay (to a /p2p-circuit address)
    (DecentralizedAverager, "_declare_for_download_periodically", "method", ()),  # averager_pace (a copy of the loop)
    (DecentralizedAverager, "_state_updated", "attribute", ()),  # averager_pace
    (DecentralizedAverager, "_matchmaking", "attribute", ()),  # averager_pace (a property there), state_stream
    # averager_pace (sets its leaders as upstream assigns it), parameter_refresh (its method name goes through the pipe)
    (DecentralizedAverager, "_run_internal", "source", ("self._matchmaking = Matchmaking(", "getattr(self, method)(*args, **kwargs)")),
    (DecentralizedAverager, "_outer_pipe", "attribute", ()),  # parameter_refresh
    (DecentralizedAverager, "_get_current_state_from_host_process", "method", ()),  # state_stream, parameter_refresh
    # state_stream (a part's request put on a queue just before its ask must meet that ask): the host answers every
    # ask of the state through one thread, started once, that takes the asks from the pipe in order
    (DecentralizedAverager, "__init__", "source", ("target=_background_thread_fetch_current_state",)),
    (averager_module, "_background_thread_fetch_current_state", "source", (
        "trigger, future = pipe.recv()", "state = get_current_state()")),
    (DecentralizedAverager, "_load_state_from_peers", "method", ("future", "timeout")),  # state_stream
    (DecentralizedAverager, "_load_state_from_peers", "source", (".all_averagers",)),  # state_stream, record_gate: the key
    (DecentralizedAverager, "load_state_from_peers", "method", ("wait", "timeout", "...")),  # state_averager, diloco_state, monitor/keeper
    (DecentralizedAverager, "rpc_join_group", "method", ("request", "context")),  # averager_gate
    (DecentralizedAverager, "rpc_aggregate_part", "method", ("stream", "context")),  # averager_gate
    (DecentralizedAverager, "rpc_download_state", "method", ("_request", "_context")),  # averager_gate

    # --- ServicerBase (hivemind/p2p/servicer.py): the averagers' RPC handlers ------------------------------------
    (ServicerBase, "_get_handle_name", "method", ("namespace", "method_name")),  # upstream_names.UpstreamRpcNames
    (ServicerBase, "_rpc_handlers", "attribute", ()),  # parameter_refresh: reset per class
    (ServicerBase, "_stub_type", "attribute", ()),  # parameter_refresh: reset per class
    (ServicerBase, "_collect_rpc_handlers", "source", ("cls._rpc_handlers is not None", 'startswith("rpc_")')),  # parameter_refresh
    (ServicerBase, "add_p2p_handlers", "method", ("p2p", "wrapper", "namespace", "balanced")),  # state_stream
    (ServicerBase, "remove_p2p_handlers", "method", ("p2p", "namespace")),  # state_stream

    # --- matchmaking (hivemind/averaging/matchmaking.py, key_manager.py): the averager's private _matchmaking -----
    (Matchmaking, "group_key_manager", "attribute", ()),  # averager_pace, state_stream
    (Matchmaking, "potential_leaders", "attribute", ()),  # averager_pace: replaced
    (Matchmaking, "current_followers", "attribute", ()),  # averager_pace
    (Matchmaking, "min_group_size", "attribute", ()),  # averager_pace
    (GroupKeyManager, "prefix", "attribute", ()),  # averager_pace, state_stream
    (GroupKeyManager, "current_key", "source", ('f"{self.prefix}.0b{self.group_bits}"',)),  # record_gate: {prefix}.0b
    (PotentialLeaders, "__init__", "method", ("peer_id", "min_matchmaking_time", "target_group_size")),  # averager_pace
    (PotentialLeaders, "peer_id", "attribute", ()),  # averager_pace
    (PotentialLeaders, "min_matchmaking_time", "attribute", ()),  # averager_pace
    (PotentialLeaders, "target_group_size", "attribute", ()),  # averager_pace
    (PotentialLeaders, "_update_queue_periodically", "method", ("key_manager",)),  # averager_pace
    (PotentialLeaders, "begin_search", "method", ("step", "key_manager", "declare")),  # averager_pace
    (PotentialLeaders, "pop_next_leader", "method", ()),  # averager_pace

    # --- the all-reduce (hivemind/averaging/allreduce.py, partition.py) ------------------------------------------
    (AllReduceRunner, "tensor_part_container", "attribute", ()),  # partial_rounds
    (TensorPartContainer, "failed_size", "attribute", ()),  # partial_rounds
    (TensorPartContainer, "total_size", "attribute", ()),  # partial_rounds
    (TensorPartContainer, "_input_parts_by_peer", "attribute", ()),  # robust_aggregation: what was sent, per reducer
    (TensorPartContainer, "local_tensors", "attribute", ()),  # robust_aggregation: the floor of the returns' check
    (TensorPartContainer, "register_processed_part", "method", ("peer_index", "part_index", "part")),  # robust_aggregation
    (TensorPartContainer, "register_failed_reducer", "source", (  # robust_aggregation: zeros go through the checked one
        "self.register_processed_part(peer_index, part_index, part_result_or_delta)",)),
    # robust_aggregation: the runner's reducer replaced after upstream built it, with a subclass whose accumulator
    # records the parts (add_) and aggregates them once the part is complete (div_)
    (AllReduceRunner, "__init__", "source", ("self.tensor_part_reducer = TensorPartReducer(",)),
    (AllReduceRunner, "tensor_part_reducer", "attribute", ()),
    (AllReduceRunner, "sender_peer_ids", "attribute", ()),  # the reducer's sender index -> peer id, in the log
    (TensorPartReducer, "__init__", "method", ("part_shapes", "num_senders")),
    (TensorPartReducer, "reset_accumulators", "method", ()),
    (TensorPartReducer, "accumulate_part", "method", ("sender_index", "part_index", "tensor_part", "weight")),
    # (and counts the part received before adding it: a wrong-sized part is left out rather than raised on)
    (TensorPartReducer, "accumulate_part", "source", (
        "self.accumulator.add_(tensor_part, alpha=weight)", "self.num_parts_received[sender_index] += 1",
    )),
    # a wrong-sized part's sender then fails its own call on the difference (and is banned)
    (AllReduceRunner, "_accumulate_parts_streaming", "source", ("averaged_part - tensor_part",)),
    (TensorPartReducer, "check_current_part_finished", "source", ("self.accumulator.div_(self.denominator)",)),
    (TensorPartReducer, "finalize", "source", ("if not self.finished.is_set():",)),
    (TensorPartReducer, "accumulator", "attribute", ()),
    # round_traffic: the all-reduce's bytes counted where its messages pass (a sender's parts out, a reducer's in
    # and out, the averaged parts back through the stub's only call)
    (AllReduceRunner, "_generate_input_for_peer", "method", ("peer_index",)),
    (AllReduceRunner, "_accumulate_parts_streaming", "method", ("stream", "sender_index")),
    (AllReduceRunner, "_get_peer_stub", "method", ("peer",)),
    (AllReduceRunner, "_communicate_with_peer", "source", (
        "inputs_aiter = attach_event_on_finished(self._generate_input_for_peer(peer_index), done_sending)",
        "stream = await self._get_peer_stub(peer_id).rpc_aggregate_part(inputs_aiter)",
    )),
    (TensorPartReducer, "part_shapes", "attribute", ()),
    (TensorPartReducer, "current_part_index", "attribute", ()),

    # --- TrainingStateAverager (hivemind/optim/state_averager.py) ------------------------------------------------
    (TrainingStateAverager, "_do", "method", ("wait_for_trigger", "optimizer_step", "zero_grad", "averaging_round",
                                              "averaging_control", "grad_scaler", "set_to_none", "timeout", "**kwargs")),  # state_averager
    (TrainingStateAverager, "_do", "source", ("self._update_scheduler()", "super().step(")),  # state_averager
    (TrainingStateAverager, "_update_scheduler", "method", ()),  # optimizer, state_averager, diloco_state, parameter_refresh, checkpoints
    (TrainingStateAverager, "_apply_averaging_results_", "method", ()),  # state_averager
    (TrainingStateAverager, "_apply_optimizer_parameters_", "method", ()),  # state_averager, parameter_refresh, diloco_state
    (TrainingStateAverager, "_local_tensors", "method", ()),  # state_averager
    (TrainingStateAverager, "_old_tensors", "attribute", ()),  # state_averager
    (TrainingStateAverager, "_load_local_tensors_into_averager_", "method", ()),  # parameter_refresh
    (TrainingStateAverager, "get_current_state", "method", ()),  # state_averager, diloco_state
    (TrainingStateAverager, "load_state_from_peers", "method", ("**kwargs",)),  # diloco_state
    (TrainingStateAverager, "load_state_from_peers", "source", ("super().load_state_from_peers(**kwargs)",)),  # diloco_state

    # --- GradientAverager (hivemind/optim/grad_averager.py) ------------------------------------------------------
    (GradientAverager, "step", "method", ("weight", "...")),  # gradient_averager
    (GradientAverager, "load_accumulators_into_averager_", "method", ()),  # gradient_averager
    (GradientAverager, "schedule_step", "method", ("scheduled_time", "**kwargs")),  # gradient_averager: the round's epoch
    (GradientAverager, "step", "source", ("control = self.schedule_step(timeout=timeout, **kwargs)",)),  # gradient_averager: every round begins there

    # --- Optimizer (hivemind/optim/optimizer.py): SwarmOptimizer subclasses it (DiLoCo's optimizer does not) ------
    (Optimizer, "_make_state_averager", "method", ("**kwargs",)),  # optimizer
    (Optimizer, "_make_progress_tracker", "method", ("target_batch_size", "**kwargs")),  # optimizer
    (Optimizer, "_make_gradient_averager", "method", ("factory", "**kwargs")),  # optimizer
    (Optimizer, "_begin_averaging_gradients", "method", ("grad_scaler",)),  # optimizer
    (Optimizer, "_average_gradients_and_load_into_optimizer", "method", ("maybe_step_control",)),  # optimizer; benchmark: hivemind_peer
    (Optimizer, "_load_local_gradients_into_optimizer", "method", ()),  # optimizer
    (Optimizer, "_load_averaged_gradients_into_optimizer_", "method", ()),  # optimizer
    (Optimizer, "_maybe_schedule_gradient_averaging", "method", ()),  # optimizer
    (Optimizer, "_maybe_schedule_state_averaging", "method", ()),  # optimizer
    (Optimizer, "_update_global_epoch", "method", ("grad_scaler",)),  # optimizer
    (Optimizer, "_tag_along_with_zero_weight", "method", ("control",)),  # optimizer
    (Optimizer, "scheduled_grads", "attribute", ()),  # optimizer (writes it)
    (Optimizer, "average_state_every", "attribute", ()),  # optimizer: a property there, which upstream's __init__ sets
    (Optimizer, "step", "method", ("closure", "batch_size", "grad_scaler")),  # optimizer
    (Optimizer, "load_state_from_peers", "method", ("**kwargs",)),  # optimizer
    (Optimizer, "_should_load_state_from_peers", "method", ()),  # optimizer: behind a round's group
    (Optimizer, "step", "source", ("self._should_load_state_from_peers()", "self.load_state_from_peers()")),  # optimizer

    # --- ProgressTracker (hivemind/optim/progress_tracker.py) ----------------------------------------------------
    (ProgressTracker, "_parse_swarm_progress_data", "method", ("metadata",)),  # progress, outer_round
    (ProgressTracker, "_progress_reporter", "method", ()),  # progress (a copy of the loop)
    (ProgressTracker, "report_local_progress", "method", ("local_epoch", "samples_accumulated", "update_global_samples")),  # progress
    (ProgressTracker, "_get_local_progress", "method", ("local_epoch", "samples_accumulated")),  # progress, outer_round
    (ProgressTracker, "update_epoch", "method", ("new_epoch",)),  # progress: when this peer saw the epoch begin (claims)
    (ProgressTracker, "max_refresh_period", "attribute", ()),  # progress: the claims' grace
    (ProgressTracker, "_local_public_key", "attribute", ()),  # progress
    (ProgressTracker, "should_report_progress", "attribute", ()),  # progress: upstream sets it, the copied loop waits
    (ProgressTracker, "global_state_updated", "attribute", ()),  # outer_round: wakes upstream's fetcher

    # --- DHT (hivemind/dht/dht.py) --------------------------------------------------------------------------------
    (DHT, "run", "method", ()),  # dht_process
    (DHT, "_inner_pipe", "attribute", ()),  # dht_process: replaced in the DHT process
    (DHT, "run", "source", ("self._inner_pipe.fileno()", "method, args, kwargs = self._inner_pipe.recv()")),  # dht_process

    # --- keys and signatures (hivemind/utils/crypto.py, dht/crypto.py) -------------------------------------------
    (RSASignatureValidator, "_PUBLIC_KEY_RE", "attribute", ()),  # record_gate, peer_records
    (RSASignatureValidator, "__init__", "source", ("RSAPrivateKey.process_wide()",)),  # identity
    (RSAPrivateKey, "_process_wide_key", "attribute", ()),  # process_patches (writes it; identity loads the key)
    (RSAPrivateKey, "_private_key", "attribute", ()),  # identity, manifest (write it: load a stored key)
    (RSAPublicKey, "_public_key", "attribute", ()),  # identity

    # --- compression (hivemind/compression/serialization.py, quantization.py) ------------------------------------
    (serialization, "_BASE_COMPRESSION_TYPES", "module attribute", ("UNIFORM_8BIT", "QUANTILE_8BIT", "BLOCKWISE_8BIT")),  # process_patches (writes it; quantization owns the codecs)
    (serialization, "deserialize_torch_tensor", "source", ("_BASE_COMPRESSION_TYPES[",)),  # quantization
    (quantization, "_BLOCKWISE_QUANTIZATION_BLOCKSIZE", "module attribute", (4096,)),  # quantization: its BLOCK_SIZE
    (Quantization, "extract", "method", ("serialized_tensor",)),  # quantization
    (BlockwiseQuantization, "quantize", "method", ("tensor", "allow_inplace")),  # quantization
    (BlockwiseQuantization, "extract", "method", ("serialized_tensor",)),  # quantization
]
# fmt: on


# --- the checks -----------------------------------------------------------------------------------------------------


def _label(owner) -> str:
    return owner.__name__ if inspect.ismodule(owner) else f"{owner.__module__}.{owner.__qualname__}"


def _is_hivemind(cls) -> bool:
    return cls.__module__.split(".")[0] == "hivemind"


@functools.lru_cache(maxsize=None)
def _assigned_on_self(cls) -> frozenset:
    """Names the class's own source assigns as `self.<name> = ...` (or `cls.<name>`), anywhere in its body."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return frozenset()
    return frozenset(
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
    )


def _hivemind_names(cls) -> set:
    """What a hivemind class has: its class attributes and methods, and the instance attributes it assigns."""
    return set(vars(cls)) | _assigned_on_self(cls)


def _has_attribute(owner, name: str) -> bool:
    return any(
        name in vars(klass) or (_is_hivemind(klass) and name in _assigned_on_self(klass)) for klass in owner.__mro__
    )


def _function(owner, name: str):
    """The plain function behind `owner.name` (a method, classmethod, staticmethod, property getter or function)."""
    raw = inspect.getattr_static(owner, name)
    if isinstance(raw, (classmethod, staticmethod)):
        raw = raw.__func__
    if isinstance(raw, property):
        raw = raw.fget
    if not callable(raw):
        raise TypeError(f"is a {type(raw).__name__}, not a function")
    return raw


def _parameters(function) -> list:
    names = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            names.append("*args")
        elif parameter.kind is parameter.VAR_KEYWORD:
            names.append("**kwargs")
        else:
            names.append(parameter.name)
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _check(owner, name: str, kind: str, parameters: tuple) -> list:
    """What is wrong with one row (an empty list: nothing)."""
    where = f"{_label(owner)}.{name} ({kind})"
    try:
        if kind in ("method", "function"):
            actual = _parameters(_function(owner, name))
            prefix = parameters[-1:] == ("...",)
            expected = list(parameters[:-1] if prefix else parameters)
            if (actual[: len(expected)] if prefix else actual) != expected:
                shown = expected + ["..."] if prefix else expected
                return [f"{where}: swarmd relies on parameters {shown}, hivemind has {actual}"]
        elif kind == "attribute":
            if not _has_attribute(owner, name):
                return [f"{where}: gone (neither on the class nor assigned to self in its source)"]
        elif kind == "module attribute":
            if not hasattr(owner, name):
                return [f"{where}: gone"]
            value = getattr(owner, name)
            if isinstance(value, Mapping):
                missing = [key for key in parameters if key not in value]
                if missing:
                    return [f"{where}: lacks the keys {missing}"]
            elif parameters and value != parameters[0]:
                return [f"{where}: is {value!r}, swarmd relies on {parameters[0]!r}"]
        elif kind == "source":
            source = inspect.getsource(_function(owner, name))
            missing = [snippet for snippet in parameters if snippet not in source]
            if missing:
                return [f"{where}: its code no longer contains {missing}"]
        else:
            return [f"{where}: unknown kind"]
    except (AttributeError, TypeError, ValueError, OSError) as e:
        return [f"{where}: {type(e).__name__}: {e}"]
    return []


def test_hivemind_still_has_what_swarmd_relies_on():
    problems = [problem for row in CONTRACT for problem in _check(*row)]
    assert not problems, (
        f"hivemind {hivemind.__version__} differs from what swarmd relies on (swarmd is built against 1.1.12); "
        f"adapt the swarmd module named in each row of tests/unit/test_hivemind_contract.py:\n  - "
        + "\n  - ".join(problems)
    )


def test_the_fence_reports_every_kind_of_mismatch():
    """The checks themselves: each kind of row fails when hivemind differs (here: rows that are wrong on purpose)."""
    wrong = [
        (DecentralizedAverager, "_no_such_method", "method", ()),
        (DecentralizedAverager, "_shutdown", "method", ()),  # it takes a timeout
        (DecentralizedAverager, "_shutdown", "method", ("timeout", "extra", "...")),
        (DecentralizedAverager, "_no_such_attribute", "attribute", ()),
        (serialization, "_NO_SUCH_TABLE", "module attribute", ()),
        (serialization, "_BASE_COMPRESSION_TYPES", "module attribute", ("NO_SUCH_TYPE",)),
        (quantization, "_BLOCKWISE_QUANTIZATION_BLOCKSIZE", "module attribute", (2048,)),
        (DHT, "run", "source", ("not in upstream's code",)),
        (DHT, "_inner_pipe", "spelling", ()),
    ]
    for row in wrong:
        assert len(_check(*row)) == 1, row
    right = [
        (DecentralizedAverager, "_shutdown", "method", ("timeout",)),
        (DecentralizedAverager, "_shutdown", "method", ("...",)),
        (ServicerBase, "_get_handle_name", "method", ("namespace", "method_name")),  # a classmethod: cls left out
        (DecentralizedAverager, "_matchmaking", "attribute", ()),  # assigned in _run_internal, not __init__
        (DecentralizedAverager, "allow_state_sharing", "attribute", ()),  # a property
    ]
    for row in right:
        assert _check(*row) == [], row


# --- the table is complete ------------------------------------------------------------------------------------------


def _swarmd_classes() -> dict:
    """(module, class name) -> the ast.ClassDef of every top-level class in swarmd's source."""
    from module_graph import PACKAGE, module_name  # tests/module_graph.py

    classes = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py":  # runs the CLI when imported
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[(module_name(path), node.name)] = node
    return classes


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")  # not dunder (nor name-mangled)


def _defined(classdef: ast.ClassDef) -> set:
    """The names a swarmd class defines: its methods and class attributes, and what it assigns to `self.<name>`."""
    names = set()
    for item in classdef.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(target.id for target in item.targets if isinstance(target, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    for node in ast.walk(classdef):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


@functools.lru_cache(maxsize=1)
def _overrides() -> dict:
    """(swarmd class, name) -> (the hivemind classes that have the name, the swarmd class whose MRO holds both) for
    every name a swarmd class defines that a hivemind class of its MRO (for a mixin such as DownloadsState, which has
    no hivemind base of its own: of the MRO of a class it is mixed into) also has."""
    classdefs = _swarmd_classes()
    found = {}
    for (module, name), _ in classdefs.items():
        cls = getattr(importlib.import_module(module), name, None)
        if not inspect.isclass(cls):
            continue
        upstream = [klass for klass in cls.__mro__ if _is_hivemind(klass)]
        if not upstream:
            continue
        for klass in cls.__mro__:
            classdef = classdefs.get((klass.__module__, klass.__qualname__))
            if classdef is None:
                continue
            for attr in _defined(classdef):
                owners = {base for base in upstream if attr in _hivemind_names(base)}
                if owners:
                    found.setdefault((klass, attr), (set(), cls))[0].update(owners)
    return found


def test_every_private_override_is_fenced():
    fenced = {(owner, name) for owner, name, _, _ in CONTRACT if inspect.isclass(owner)}
    unfenced = sorted(
        f"{klass.__module__}.{klass.__qualname__}.{attr} (hivemind: {', '.join(sorted(map(_label, owners)))})"
        for (klass, attr), (owners, _) in _overrides().items()
        if _private(attr) and not any((owner, attr) in fenced for owner in owners)
    )
    assert not unfenced, (
        "swarmd overrides or assigns private hivemind names that tests/unit/test_hivemind_contract.py does not fence; "
        "add a row for each (the hivemind class that has it):\n  - " + "\n  - ".join(unfenced)
    )


def _names(tree: ast.AST) -> tuple[set, set]:
    """(names the code defines: functions, classes, variables, `self.<name>` and imports; attribute names it reads or
    writes on any object, with the names it imports from hivemind)."""
    defined, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
            if isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                defined.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hivemind":
            used.update(alias.name for alias in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return defined, used


def test_every_private_hivemind_name_swarmd_touches_is_fenced():
    """The grep, automated: a private name that swarmd (or a benchmark) reads, writes or imports, that swarmd never
    defines itself and that hivemind defines (anywhere), is hivemind's: it needs a row."""
    from module_graph import PACKAGE  # tests/module_graph.py

    ours_defined, ours_used = set(), set()
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "benchmarks").glob("*.py")]:
        defined, used = _names(ast.parse(path.read_text()))
        ours_defined |= defined
        ours_used |= used
    theirs = set()
    for path in PACKAGE_OF_HIVEMIND.rglob("*.py"):
        theirs |= _names(ast.parse(path.read_text()))[0]
    fenced = {name for _, name, _, _ in CONTRACT}
    unfenced = sorted(name for name in (ours_used - ours_defined) & theirs if _private(name) and name not in fenced)
    assert not unfenced, (
        "swarmd uses private hivemind names that tests/unit/test_hivemind_contract.py does not fence; add a row for "
        "each (its owner: the hivemind class or module that has it): " + ", ".join(unfenced)
    )


def _flavour(function) -> str:
    if inspect.isasyncgenfunction(function):
        return "async generator"
    return "coroutine" if inspect.iscoroutinefunction(function) else "plain function"


def test_overrides_keep_upstreams_sync_or_async():
    """An override must be what upstream's is: a coroutine for a coroutine (hivemind awaits it), an async generator
    for an async generator (an RPC handler that streams), a plain function for a plain one."""
    mismatched = []
    for (klass, attr), (_, composite) in _overrides().items():
        if attr.startswith("__") or attr not in vars(klass):
            continue  # dunders are Python's, not hivemind's hooks; a name only assigned to self is no method
        later = composite.__mro__[composite.__mro__.index(klass) + 1:]
        upstream = next((base for base in later if _is_hivemind(base) and attr in vars(base)), None)
        if upstream is None:
            continue
        try:
            mine, theirs = _function(klass, attr), _function(upstream, attr)
        except TypeError:
            continue  # an attribute, not a method
        if _flavour(mine) != _flavour(theirs):
            mismatched.append(
                f"{_label(klass)}.{attr} is a {_flavour(mine)}, {_label(upstream)}.{attr} a {_flavour(theirs)}"
            )
    assert not mismatched, "\n".join(mismatched)
