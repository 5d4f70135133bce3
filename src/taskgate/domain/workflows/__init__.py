"""Workflows and checklists as data (pure): their definitions and validation, the run stack, variables, expressions,
triggers and diagrams."""
