"""The synthesis room: a run's plan (work items, shards, submission order), the dialogue workers and the
executor that runs the plan on them, the running totals, the run itself (``run_synthesis``) and the
interview summary it reports."""
