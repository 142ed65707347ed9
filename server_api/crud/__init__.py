"""Database reads and writes. Every function that writes also commits (or rolls back),
so a transaction never spans two crud calls; state checks that must not race are
made inside the same locked transaction as the write they guard."""
