"""Pure domain: entities, the session transition table, policy rules and errors. Imports only stdlib."""
