"""Policies (pure): the guards of transitions. What a refusal says (`violations`), what a policy sees and answers
(`facts`: the facts, the `Policy` protocol, the verdict), the ten built-in rules (`rules`), and building them from
configuration (`book`)."""
