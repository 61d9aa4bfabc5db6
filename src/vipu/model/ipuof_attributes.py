"""Names in the attributes of a GCD's IPUoF configuration that vipu adds to the vendor's, in a
module of their own: the `vipu` command reads them, and importing the partition model for a name
would cost it a fifth of a create's start-up."""

ATTACH_KEY_ATTRIBUTE = "Attach Key"  # an addition of ours to the vendor's attributes; their clients ignore it
