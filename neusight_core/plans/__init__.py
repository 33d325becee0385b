"""Plans: what is done to a traced table before it is timed (operator fusion, parallel plans, experts)."""
