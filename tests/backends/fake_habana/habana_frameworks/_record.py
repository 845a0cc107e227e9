"""Calls the stand-in saw, in order: ``(name, details)``. Tests may add their own events."""

events: list[tuple[str, dict]] = []


def record(name: str, **details) -> None:
    events.append((name, details))


def names() -> list[str]:
    return [name for name, _ in events]
