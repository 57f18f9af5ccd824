"""Shared foundations: durable I/O, the manifest schema, the event log and rank-safe helpers."""
