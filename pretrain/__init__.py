"""Server-side pretraining of the compact face backbone on public identities."""
