"""The workflow runtime: a session's stack of steps, approvals, checklists and nested workflows, driven by the engine,
and the catalogue's use cases."""
