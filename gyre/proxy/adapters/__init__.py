"""One module per API dialect: request validation/normalisation and response writing."""
