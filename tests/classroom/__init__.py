"""The classroom: lessons, step mode's values, the handout and the room's votes."""
