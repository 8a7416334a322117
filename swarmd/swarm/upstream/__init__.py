"""The fence around hivemind (pinned at 1.1.12): every swarmd class that subclasses or mixes into hivemind's
machinery (averagers, the optimizer, the progress tracker, the all-reduce runner, the DHT process, compression), and
the process-wide patches (process_patches.py). Only these modules touch hivemind's private names, and each such
name has a row in tests/unit/test_hivemind_contract.py, so a hivemind upgrade fails that one test with the whole list.

- optimizer.py: SwarmOptimizer, hivemind.Optimizer observed and bounded (the sync strategy's optimizer);
  state_averager.py / gradient_averager.py: its averagers; diloco_state.py: DiLoCo's state averager;
  outer_round.py: DiLoCo's pseudo-gradient averager and round tracker; peer_parts.py: what every strategy's
  optimizer composes (averager settings, bounded state downloads, clipping, shutdown of a failed construction);
- averager_gate.py (private swarms, exclusion), robust_aggregation.py (CenteredClip in hivemind's reducer),
  partial_rounds.py, averager_pace.py, averager_shutdown.py, state_stream.py, parameter_refresh.py: the averagers'
  mixins, each one change; rpc_names.py names their RPCs as upstream does;
- progress.py (the throttled tracker), dht_process.py, quantization.py, record_gate.py, identity.py.

DHT record validators built on hivemind's public plugin class (RecordValidatorBase) without private names stay
with the records they guard (peer_records.py, manifest_records.py...).
"""
