"""The ground floor: errors, console progress, files and folder locks, the registry."""
