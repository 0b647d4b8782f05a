"""ember.backends"""
