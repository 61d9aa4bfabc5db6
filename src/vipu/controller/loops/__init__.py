"""The controller's background loops: the health pass, which asks every agent what it holds and
reports what it finds to the owners, who alone act on it."""
