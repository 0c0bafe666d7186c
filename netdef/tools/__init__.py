"""The command-line tools beyond training: each verb's logic in a module of its own."""
