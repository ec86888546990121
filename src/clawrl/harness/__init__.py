"""Harness mode: sandboxed runs of unmodified agent harnesses on verified tasks, rollout groups,
GRPO (or PRM + outcome) over each rollout's prefix tree, Pass@k evaluation.

=================  ==================================================================
module             does
=================  ==================================================================
``tasks``          the task format (``task.toml``, ``files/``, ``verify``) and loader
``suite``          the built-in 44-task suite's generator (shipped in ``tasks/``)
``sandbox``        bwrap sandbox (or the documented fallback), limits, isolation record
``relay``          TCP <-> unix-socket relay: the gateway is the sandbox's only address
``verify``         running verifiers; :class:`clawrl.errors.VerifierError` is never reward 0
``adapters``       ``reference`` agent and external harness adapters
``rollout``        one rollout: sandbox, harness, verifier, record
``groups``         which rollout groups carry a learning signal
``judging``        PRM step scores: each turn's next state judged and stored (prm_outcome)
``samples``        rollouts -> trainer samples (with steps) through the prefix tree
``passk``          the unbiased Pass@k estimator
``loop``           the train / eval loops behind ``clawrl harness``
=================  ==================================================================
"""
