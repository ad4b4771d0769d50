"""The customer-service agent: a shop's MCP server (orders, tickets, refunds that need
approval), a customer's memory (profile, past tickets) and tickets that try to inject
instructions, in English and Chinese. `python -m examples.customer_service --lang en|zh`."""
