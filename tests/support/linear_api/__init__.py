"""A Linear stand-in: GraphQL executed with graphql-core against Linear's schema converted from @linear/sdk."""

from tests.support.linear_api.standin import DEFAULT_STATES, LinearStandIn

__all__ = ["DEFAULT_STATES", "LinearStandIn"]
