"""Planning estimates: 6ND compute, memory and layout, checkpoint intervals; `field plan`."""
