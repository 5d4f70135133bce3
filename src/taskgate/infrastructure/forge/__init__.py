"""The forge: GitHub's API through githubkit, and pushes of session branches to the project's remote."""
