"""Runs as both playbooks and batched deploys have them: the serial batches and failure budgets
(``rollout``), and the journal of every event, read back by resume, ``runs`` and the report."""
