"""The forge loop: sessions pushed and opened as pull requests, their checks and reviews fed back to the agents, merged
through the forge (docs/forge.md); its ports."""
