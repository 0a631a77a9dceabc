"""Helpers shared by tests in several directories: real appliances, wire clients, replicated clusters."""
