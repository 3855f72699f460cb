"""The only modules that know other libraries' internals; each says what it relies on and how to
switch it off."""
