# JS package and playground targets (issue #5).
