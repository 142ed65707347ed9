"""Use cases composed from crud, storage and strategies; no HTTP here.

A use case that a route or a background job calls owns its transaction (core.db.transaction):
committed once when the work is done, rolled back when a domain error or anything else is
raised. Helpers it calls with its session (the round state machine in services.rounds, the
device checks in services.auth) join that transaction and never commit."""
