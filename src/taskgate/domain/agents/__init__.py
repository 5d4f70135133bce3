"""Agent types (pure): commands and their placeholders, the shipped presets, and what an agent's CLI reports."""
