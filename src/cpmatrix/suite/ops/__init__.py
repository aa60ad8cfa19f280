"""The CP ops of the reference suite, one concept per module (see ``suite/README.md``)."""
