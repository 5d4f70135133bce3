"""Use cases and the ports they need. Imports the domain only."""
