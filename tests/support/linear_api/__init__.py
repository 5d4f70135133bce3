"""A Linear stand-in: GraphQL executed with graphql-core against Linear's schema converted from @linear/sdk."""
