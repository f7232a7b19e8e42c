"""The asynchronous actor-learner runtime: threads, queues, processes.

- `messages`: `Experience`, `ActorFailure`, `PolicyBroadcast` and the params' bytes.
- `actor`: the actor loop (in a thread, or in a Ray process).
- `learner`: the rollout buffer, the learner loop and its report.
- `transport`: the transport interface and its thread implementation.
- `ray_transport`: actors as Ray processes.
- `supervisor`: restarts failed actors.
- `watchdog`: reports a run that makes no progress.
- `inference`: one shared policy call for the thread actors of a device.
- `evaluate`: greedy evaluation, in training and on demand.
"""
