"""Use cases composed from crud, storage and strategies; no HTTP here."""
