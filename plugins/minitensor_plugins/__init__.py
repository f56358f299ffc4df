"""minitensor's built-in plugins: scorers, attention poolings and positional encodings.

They are registered exactly the way a third-party plugin is: each module here has
``@minitensor.hookimpl`` functions returning ``{name: class}``, and
``minitensor.plugins.DEFAULT_PLUGINS`` lists the modules. Read one of them as the template
for a plugin of your own (``plugins/example-cosine`` is a complete third-party distribution);
the contract they keep is in ``minitensor/core/hookspecs.py``.
"""
