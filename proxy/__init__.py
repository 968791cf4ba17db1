"""kvroute gateway: every socket, task, timer and environment variable lives here."""
