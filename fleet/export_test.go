package fleet

// NATSURL returns the test cluster's servers for the examples.
func NATSURL() string { return natsURL }
