"""The agent sandbox (issue 39): bubblewrap around each agent process, the network it may reach, the limits it runs
under, and the probe `doctor` reports. See docs/design/sandbox.md and docs/agents.md."""
