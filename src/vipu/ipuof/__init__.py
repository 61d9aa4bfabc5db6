"""The IPUoF side of a partition: the configuration files its clients read."""
