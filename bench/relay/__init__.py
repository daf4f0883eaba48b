"""The delay relay (relay.c) and its Python driver (delay.py)."""
