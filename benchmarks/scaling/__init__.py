"""How the communication runtime scales to many simulated workers (issue 23 §6)."""
